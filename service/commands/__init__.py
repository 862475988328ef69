"""One module per thing that happens: a model uploaded, a push or CI hook received, results posted, a job
claimed, executed or released, an alert acknowledged, a project, hook or token made, the schema migrated.
Each takes the services bundle (service/services.py), owns its transaction and runs its after-commit
effects; who may do it is the entry point's to say, handed in as `authorize`. The schema's migration
takes a database URL instead: `fusionwatch db` runs before there is a service to bundle."""
