# SPDX-License-Identifier: MIT
"""The package's version: the project's (CMakeLists.txt, project(... VERSION))."""
__version__ = "0.1.0"
