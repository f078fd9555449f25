"""The twice CLI, the suite matrix and the release gate."""
