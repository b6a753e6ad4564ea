"""dmlkit.data"""
