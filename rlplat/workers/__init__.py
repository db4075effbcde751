"""What runs on a device: the role workers and their training engines."""
