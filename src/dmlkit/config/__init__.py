"""dmlkit.config"""
