"""``python -m atroposlib.inference --model FOLDER``: the ``atropos-inference`` command."""

from atroposlib.cli.inference import main

if __name__ == "__main__":
    main()
