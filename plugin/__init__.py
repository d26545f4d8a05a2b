"""k8s-accelerator-devplugin: the internal device model, discovery, serving and the CLI."""
