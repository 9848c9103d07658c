"""The engine: model repository, backends, worker pool, dynamic batching (see DESIGN.md)."""
