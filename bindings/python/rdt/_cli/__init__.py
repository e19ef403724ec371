"""The ``rdt`` command (``python -m rdt``, console script ``rdt``): _main
parses the command line and runs _doctor or _bench, which talk to a second
process running _peer (``python -m rdt._cli._peer``). Nothing is imported
here, so that running _peer imports no module twice."""
