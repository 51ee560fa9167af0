from specctl.cli import main

main()
