"""dmlkit.models"""
