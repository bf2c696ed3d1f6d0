import os

# Hermetic Prefect settings; must be set before prefect is imported anywhere.
os.environ.setdefault("PREFECT_HOME", os.path.join(os.path.dirname(__file__), ".prefect-test-home"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
