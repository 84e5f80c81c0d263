"""Admission on create and update: defaults, validation, Priority, ResourceQuota, service accounts."""
