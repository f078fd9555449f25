pytest_plugins = ["evals.pytest_plugin"]
