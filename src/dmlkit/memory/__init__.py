"""dmlkit.memory"""
