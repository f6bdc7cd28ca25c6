"""The decoder's child process, as `DecoderProcess` starts it: `python -m functions.validation.decoder_child`.

A module of its own: run as `-m functions.validation.decoder_process`, that module would be imported
twice (once by the package, once as `__main__`), which runpy warns about.
"""

from functions.validation.decoder_process import main

if __name__ == "__main__":
    main()
