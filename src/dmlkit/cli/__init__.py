"""dmlkit.cli"""
