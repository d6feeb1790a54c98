"""The Textual console: the app, its panes and screens, and the bridge from supervision
events to messages. With tui.cli, the only package that imports textual."""
