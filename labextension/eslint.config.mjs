// ESLint configuration of the JupyterLab extension template (jupyterlab/extension-template),
// adapted: warnings fail `npm run lint:check` (--max-warnings 0); interfaces keep their data names (GpuInfo, not IGpuInfo: they mirror the server's
// JSON), and the node unit tests and the galata UI tests are linted too (their own tsconfig).
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';
import prettierRecommended from 'eslint-plugin-prettier/recommended';
import globals from 'globals';
import jupyterPlugin from '@jupyter/eslint-plugin';

export default defineConfig([
  {
    ignores: [
      'node_modules',
      '**/node_modules',
      'lib',
      'test-build',
      'coverage',
      '**/*.js',
      '**/*.mjs',
      '**/*.d.ts',
      'ui-tests/playwright-report',
      'ui-tests/test-results'
    ]
  },
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    plugins: {
      jupyter: jupyterPlugin
    }
  },
  jupyterPlugin.configs.recommended,
  {
    files: ['**/*.ts', '**/*.tsx'],
    languageOptions: {
      globals: {
        ...globals.browser,
        ...globals.es2015,
        ...globals.node
      }
    },
    rules: {
      '@typescript-eslint/no-unused-vars': ['warn', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      '@typescript-eslint/no-use-before-define': 'off',
      // English only: the extension has no ITranslator (yet)
      'jupyter/no-untranslated-string': 'off',
      // the status bar item and the panel are created at activation: the modules are needed
      // at once, a lazy import would only delay them
      'jupyter/prefer-lazy-imports': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  prettierRecommended
]);
