"""dmlkit.mining"""
