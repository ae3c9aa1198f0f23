"""The steward: a resident model (an instance with the system role "steward") that answers questions
about the cluster through read-only tools, and proposes changes that run only when an operator approves."""
