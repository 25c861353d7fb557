-- expand
-- 0031_process_internal_ca (expand: adds columns, drops nothing; issue 35,
-- docs/pki.md "Rotating the internal CA"). Each process with the internal
-- control API configured reports, with every heartbeat, the internal CAs
-- it accepts peers from (internal_ca_ids: their ids, pki.NodeCAID, comma
-- separated, the one in force first) and the one whose certificate it
-- presents (internal_cert_ca). An internal-CA rotation activates once every
-- such live process trusts the new CA, and retires once each presents a
-- certificate from it. '' for a process without the internal control API,
-- and for every row a build before this one wrote.
ALTER TABLE processes ADD COLUMN internal_ca_ids text NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN internal_cert_ca text NOT NULL DEFAULT '';
