"""(being written)"""


def register(app):
    pass
