import os

DEBUG = False
PORT = int(os.environ.get("PORT", "8000"))
