pytest_plugins = ["twice.evals.pytest_plugin"]
