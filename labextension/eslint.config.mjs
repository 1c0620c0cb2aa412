// ESLint for the lab extension: the recommended JavaScript and TypeScript rules,
// React's rules of hooks, and nothing that fights prettier (which formats).
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import reactHooks from 'eslint-plugin-react-hooks';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'labextension_static/', 'node_modules/', 'style/', '*.mjs'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.{ts,tsx}', 'test/**/*.ts'],
    languageOptions: { globals: { ...globals.browser } },
    plugins: { 'react-hooks': reactHooks },
    rules: {
      ...reactHooks.configs.recommended.rules,
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      // JupyterLab's own convention for interfaces (IGpuStatus, IMe ...).
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      // JupyterLab's convention for command ids (namespace CommandIDs { ... }).
      '@typescript-eslint/no-namespace': 'off',
      eqeqeq: ['error', 'smart'],
      curly: ['error', 'all']
    }
  },
  prettier
);
