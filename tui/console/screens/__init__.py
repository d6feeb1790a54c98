"""Modal screens of the console: confirmations, help, the profile picker."""
