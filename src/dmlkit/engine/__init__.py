"""dmlkit.engine"""
