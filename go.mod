module github.com/rdt-project/rdt

go 1.26.8

require (
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.49.0
)

require (
	github.com/ianlancetaylor/cgosymbolizer v0.0.0-20241129212102-9c50ad6b591e // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
