"""dmlkit.methods"""
