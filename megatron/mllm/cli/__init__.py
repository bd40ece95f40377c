# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's command-line tools, installed as ``orchweave-*`` console scripts.

Each tool is argument parsing, one library call and printing; ``tools/<name>.py`` runs the same
``main`` from a checkout.
"""
