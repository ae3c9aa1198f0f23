def add_control_routes(app, node):
    pass
