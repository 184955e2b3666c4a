# SPDX-License-Identifier: MIT
"""shardfs: Python face of libshardfs-rank (placeholder until the package lands).

Only the version is here: the project version (CMakeLists.txt's
project(VERSION)), which the install test checks after installing the .deb.
"""

__version__ = "0.1.0"
