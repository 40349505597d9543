"""``python -m ext_proc.devbackend --host H --port P [--model M]``: see ``app.main``."""

from ext_proc.devbackend.app import main

main()
