"""Control loops of kube-controller-manager and the default scheduler, scaled down."""
