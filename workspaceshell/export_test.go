package workspaceshell

// GitEnv is the environment workspace_exec gives git, for the tests.
var GitEnv = gitEnv
