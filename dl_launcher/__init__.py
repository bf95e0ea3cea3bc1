"""dl-launcher's one user-facing CLI (`dl-launcher`, a console script): the verbs users run from
their laptop. Deploying stays `cdk deploy -c profile=...`."""
