// Wrapper module of the pod sandbox binary (main.go); no dependencies.
module kraftkeeper.local/tools/pause

go 1.22.0
