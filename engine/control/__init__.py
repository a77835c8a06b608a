"""The control plane: requests that create and change schedules and tenants, and what they read."""
