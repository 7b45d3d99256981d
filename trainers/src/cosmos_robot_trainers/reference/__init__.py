"""Single-file reference implementations the modular trainers are tested against."""
