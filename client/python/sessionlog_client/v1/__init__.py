"""Generated from proto/sessionlog/v1 by client/python/gen.py. DO NOT EDIT."""
