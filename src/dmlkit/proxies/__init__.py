"""dmlkit.proxies"""
