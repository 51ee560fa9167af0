"""`python -m specctl ...`, also what `torchrun -m specctl generate ...` runs on every rank."""

from specctl.cli import main

if __name__ == "__main__":
    main()
