"""devauth"""
