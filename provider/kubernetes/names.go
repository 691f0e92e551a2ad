package kubernetes

// Labels and annotations faas-netes puts on function objects; tooling (the gateway, faas-cli, dashboards) reads them.
const (
	// LabelFunction names the function on its Deployment, Service selector and pods.
	LabelFunction = "faas_function"
	// LabelApp and LabelController are set on function pods, as faas-netes does.
	LabelApp        = "app"
	LabelController = "controller"
	// LabelScaleMin and LabelScaleMax bound the replicas of a function (OpenFaaS' autoscaling labels).
	LabelScaleMin = "com.openfaas.scale.min"
	LabelScaleMax = "com.openfaas.scale.max"
	// AnnotationPrometheusScrape is set to "false" unless the function sets it.
	AnnotationPrometheusScrape = "prometheus.io.scrape"
	// AnnotationServiceAccount names the service account function pods run as.
	AnnotationServiceAccount = "com.openfaas.serviceaccount"

	// LabelSecretManagedBy and SecretManagedByValue mark the Secrets OpenFaaS manages; only those are listed.
	LabelSecretManagedBy = "app.kubernetes.io/managed-by"
	SecretManagedByValue = "openfaas"
	// SecretsMountPath is where function containers see each secret as a file.
	SecretsMountPath = "/var/openfaas/secrets"

	// LabelNamespace marks namespaces functions may be deployed to: openfaas: "1".
	LabelNamespace      = "openfaas"
	LabelNamespaceValue = "1"

	// EnvProcess is the environment variable carrying a function's fprocess.
	EnvProcess = "fprocess"

	// LabelServiceName is the EndpointSlice label naming the Service the slice belongs to.
	LabelServiceName = "kubernetes.io/service-name"
)

// EnvLDLibraryPath is where a GPU function's container finds the shim (the other variables of a GPU function's
// container are the function contract's: package contract).
const EnvLDLibraryPath = "LD_LIBRARY_PATH"

// Names of the volumes and the init container added to GPU functions.
const (
	ShimVolume          = "faas-gpu-shim"
	SocketVolume        = "faas-gpu-sockets"
	ShimInitContainer   = "faas-gpu-shim"
	ShimMountPath       = "/opt/faas-gpu/lib"
	ShimLibrary         = "libcuda.so.1"
	secretsVolumeSuffix = "-projected-secrets"
	tmpVolume           = "tmp"
)
