"""Version of the langgraph-batch distribution."""

__version__ = "0.1.0"
