"""mi-toy-backend: the example third-party plugin of docs/PLUGINS.md."""
