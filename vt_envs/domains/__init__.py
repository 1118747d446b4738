"""The tool domains: one module (or package) per registered env id."""
