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

// Environment of a GPU function's container: the shim and the function template read these.
const (
	EnvGPU               = "FAAS_GPU"
	EnvGPUFunction       = "FAAS_GPU_FUNCTION"
	EnvGPUSocket         = "FAAS_GPU_SOCKET"
	EnvGPURemotingSocket = "FAAS_GPU_REMOTING_SOCKET"
	EnvGPUMemory         = "FAAS_GPU_MEMORY_BYTES"
	EnvGPUSLO            = "FAAS_GPU_SLO"
	EnvGPUPercentile     = "FAAS_GPU_SLO_PERCENTILE"
	EnvGPUIsolation      = "FAAS_GPU_ISOLATION"
	EnvGPUScratch        = "FAAS_GPU_SCRATCH"
	EnvGPUModel          = "FAAS_GPU_MODEL"
	// EnvGPUSelfRegister asks the gpu-python template to register with its node's gpuserver at start (the
	// provider cannot reach the gpuserver of the node a pod lands on); the answer carries the remoting token.
	EnvGPUSelfRegister = "FAAS_GPU_SELF_REGISTER"
	// EnvGPURegistrationTicket is the credential that registers exactly the function's spec (auth.Key.Ticket).
	EnvGPURegistrationTicket = "FAAS_GPU_REGISTRATION_TICKET"
	EnvLDLibraryPath         = "LD_LIBRARY_PATH"
)

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
