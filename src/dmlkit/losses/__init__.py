"""dmlkit.losses"""
