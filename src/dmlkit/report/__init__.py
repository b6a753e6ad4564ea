"""dmlkit.report"""
