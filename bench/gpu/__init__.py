"""Real SGLang on one GPU: the site bundle, the test models, the checks and the measured run.

``dynspec-bench gpu {bundle,models,run,report}`` (or ``python -m dynspec.bench.gpu``); the run is
one bounded command on a GPU machine without a package index (see bench/results/h200/README.md).
"""
