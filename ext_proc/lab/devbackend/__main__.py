"""``python -m ext_proc.lab.devbackend --host H --port P [--model M]``: see ``app.main``."""

from ext_proc.lab.devbackend.app import main

main()
