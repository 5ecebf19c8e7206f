"""The admin services over the namespace and the data path: exports, SMB shares, accounts and
admins, alerts and events, jobs, health, inventory, metrics, fsck, trash, quotas as the admin sees
them, tier settings; the schema and CRUD base they share."""
