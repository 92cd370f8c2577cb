"""Fault injection (`debug.fault`): imported only where faults are injected."""
