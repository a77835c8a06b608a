"""The engine's background loops and the module that runs them."""
