"""dmlkit.evaluation"""
