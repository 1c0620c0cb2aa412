"""Configuring a hub for gpulab: the embedded single-server hub, the hub-wide setup
(APIs, scopes, roles, templates), the demo authenticator and the culler service."""
