"""Discovery: the only code that reads sysfs and /dev, and decides when to read it again.

Backends turn a node's files into a frozen :class:`~value_types.devices.DeviceSet` and never
raise; the monitor decides when to scan (inotify, kernel uevents, a slow safety-net rescan)
and re-reads the few health files that change without an event; all of that blocking work
runs on one worker thread that nothing waits for, so a hung driver never stalls serving.
"""
