"""`python -m specctl ...`, also what `torchrun -m specctl generate ...` runs on every rank."""

from specctl.entry import main

if __name__ == "__main__":
    main()
