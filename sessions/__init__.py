"""Session and voice state shared by gateway replicas (DESIGN §4)."""
